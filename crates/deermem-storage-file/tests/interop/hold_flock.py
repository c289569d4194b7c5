#!/usr/bin/env python3
"""Holds an exclusive BSD flock on a file (as the Python reference locks .memory.lock) until a
line arrives on stdin. Prints "locked" once the lock is held.

Usage: hold_flock.py <lock file>
"""

import fcntl
import sys

with open(sys.argv[1], "a+b") as handle:
    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    sys.stdout.write("locked\n")
    sys.stdout.flush()
    sys.stdin.readline()
    fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
