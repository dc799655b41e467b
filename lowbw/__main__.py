import sys

from lowbw.cli import main

sys.exit(main())
