"""What the tests share: the repository's paths and test data, the CLI runner, local servers (HTTP, S3, a Hub
stand-in), tokenize's kill points, and the convert and trainer helpers. Tests import from here, never from
`conftest` or from one another."""
