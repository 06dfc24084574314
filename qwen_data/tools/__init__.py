"""Looking at what was made: verify, samples read back as rows, inspect, stats and the HTML report."""
