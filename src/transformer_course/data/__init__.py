"""Data layer (the bottom of the package): Multi30k files, tokenisers, vocabularies, batching order."""
