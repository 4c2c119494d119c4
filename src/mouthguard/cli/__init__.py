"""The ``mouthguard`` command line."""
