import sys

from trainer.cli import main

if __name__ == "__main__":  # a retrain's child process imports this module too (multiprocessing's spawn)
    sys.exit(main())
