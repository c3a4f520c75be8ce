import sys

from trainer.cli import main

sys.exit(main())
