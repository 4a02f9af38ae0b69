import os
import sys

sys.path.insert(0, "/tmp/walk")
import walkhook

walkhook.install(os.environ["WALK_FILE"])
