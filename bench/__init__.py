"""compcache's benchmark suite: the seed experiments on today's Linux. See bench/README.md."""
