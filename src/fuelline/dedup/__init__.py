"""Two-level deduplication: exact hashes, then MinHash + LSH with Jaccard verification."""
