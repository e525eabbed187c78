"""The thesaurus: running means, neighbours re-ranked against hubness, versions' drift, meaning shift."""
