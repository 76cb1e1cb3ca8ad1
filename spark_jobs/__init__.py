"""PySpark maintenance jobs over a whole bucket: merge, recover, scrub (issue 6).

Importing this package must not import pyspark: the daemon installs without the `spark` extra."""
