"""The device's learning loop's parts that need a package of their own (the loop's core modules sit in ``trainer/``)."""
