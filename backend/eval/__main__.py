import sys

from backend.eval.cli import main

sys.exit(main())
