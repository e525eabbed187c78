"""Files: feeds, the thesaurus store and its directories, files written atomically."""
