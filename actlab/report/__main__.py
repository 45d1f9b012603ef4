"""python -m actlab.report: the command line of a report (actlab/report/__init__.py)."""
import sys

from actlab.report import main

sys.exit(main(sys.argv))
