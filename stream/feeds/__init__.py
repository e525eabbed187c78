"""What comes in: the input records' contracts, feed replay, retention, batch embedding of a feed."""
