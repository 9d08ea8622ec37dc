import sys

from measure_agent.cli import main

sys.exit(main())
