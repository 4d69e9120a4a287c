import sys

from solar.cli import main

sys.exit(main())
