"""Redis: the shared client and every store the roles keep there."""
