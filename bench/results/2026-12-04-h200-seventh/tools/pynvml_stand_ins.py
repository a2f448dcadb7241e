"""Device check (run from the repository root): the installed pynvml loaded through _load_pynvml's stand-ins
equals a plain import (every name; functions' name, doc, module, wrapped)."""
import json, site, subprocess, sys
CODE = r'''
import sys
sys.path.insert(0, ".")
if sys.argv[1] == "lent":
    from infer_units.helpers.facts.gpus import _load_pynvml
    m = _load_pynvml()
    gone = sorted(x for x in ("re", "enum", "collections", "functools", "threading", "string") if x in sys.modules)
else:
    import pynvml as m
    gone = None
import json
out = {}
for k in sorted(dir(m)):
    v = getattr(m, k)
    if k in ("find_library", "string", "threading", "cdll", "pydll", "pythonapi", "libLoadLock"):
        out[k] = type(v).__name__
    elif callable(v):
        out[k] = [str(getattr(v, a, None)) for a in ("__name__", "__qualname__", "__doc__", "__module__")] + [getattr(getattr(v, "__wrapped__", None), "__name__", None), sorted(getattr(v, "__dict__", {}).keys()) if not isinstance(v, type) else None]
    elif not k.startswith("_"):
        out[k] = repr(v)[:80]
print(json.dumps({"file": m.__file__, "heavy_loaded": gone, "names": out}, sort_keys=True))
'''
plain = json.loads(subprocess.run([sys.executable, "-c", CODE, "plain"], capture_output=True, text=True, check=True).stdout)
lent = json.loads(subprocess.run([sys.executable, "-IS", "-c", "import site,sys; " + "sys.path += %r\n" % site.getsitepackages() + CODE, "lent"], capture_output=True, text=True, check=True).stdout)
diff = [k for k in plain["names"] if plain["names"][k] != lent["names"].get(k)]
print("pynvml:", plain["file"], "|", lent["file"])
print("names:", len(plain["names"]), "differing:", diff[:20])
print("heavy modules loaded by _load_pynvml:", lent["heavy_loaded"])
