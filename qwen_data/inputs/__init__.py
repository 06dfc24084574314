"""Inputs as they come (files, folders, globs, parquet, Arrow, the Hub cache, stdin) → records, each knowing its file and line."""
