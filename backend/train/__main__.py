import sys

from backend.train.cli import main

sys.exit(main())
