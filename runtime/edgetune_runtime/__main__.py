import sys

from edgetune_runtime.server import main

sys.exit(main())
