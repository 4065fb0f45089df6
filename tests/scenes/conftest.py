"""Scenes tests: Mesa's llvmpipe gets one thread (the machine's two cores are shared), set before
any test creates the process's EGL context."""

import os

os.environ.setdefault("LP_NUM_THREADS", "1")
