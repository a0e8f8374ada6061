"""pytest plugin (entry point ``validate_batch``): fixtures for engine test suites."""
