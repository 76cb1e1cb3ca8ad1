"""PySpark maintenance jobs over a whole bucket: merge, recover, scrub.

Importing this package must not import pyspark: the daemon installs without the `spark` extra."""
