"""What comes in: the input records' contracts, hashtags normalised, tweet text cleaned."""
