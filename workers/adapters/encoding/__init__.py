"""The transformer encoder and its tokenizers, on CPU and GPU; word vectors."""
