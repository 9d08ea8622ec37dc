import sys

from tuner.entry_point import main

sys.exit(main())
