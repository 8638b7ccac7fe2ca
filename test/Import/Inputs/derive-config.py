"""derive-config.py SRC DST EDIT: a model dir DST with SRC's weights (a
copy) and SRC's config.json changed by the Python statement EDIT on `c`."""
import json
import os
import shutil
import sys

src, dst, edit = sys.argv[1:4]
os.makedirs(dst, exist_ok=True)
for name in os.listdir(src):
    if name.endswith(".safetensors"):
        shutil.copy(os.path.join(src, name), dst)
with open(os.path.join(src, "config.json")) as f:
    c = json.load(f)
exec(edit)
with open(os.path.join(dst, "config.json"), "w") as f:
    json.dump(c, f, indent=1)
