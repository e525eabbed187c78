"""Tweet text: cleaning, language, dedup keys, hashtag normalisation."""
