"""Running a step over inputs: the pipeline driver, worker processes, Ray, progress, and merging shards."""
