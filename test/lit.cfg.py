# lit configuration for Duck: tool substitutions and test discovery.
import os
import sys

import lit.formats
from lit.llvm import llvm_config

config.name = "Duck"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".test", ".mlir", ".json"]
config.excludes = ["Inputs", "lit.cfg.py", "lit.site.cfg.py", "unit", "oracle", "fuzz", "serve", "CMakeLists.txt"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.duck_obj_root, "test")

llvm_config.use_default_substitutions()  # FileCheck, not, count
llvm_config.with_environment("PATH", config.duck_tools_dir, append_path=True)
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)

config.substitutions.append(("%duck_src", config.duck_src_root))
config.substitutions.append(("%duck_bin", config.duck_tools_dir))
config.substitutions.append(("%duck_obj", config.duck_obj_root))
config.substitutions.append(("%models", os.path.join(config.duck_src_root, "models")))
config.substitutions.append(("%python", sys.executable))
config.substitutions.append(("%inputs", os.path.join(config.test_source_root, "Inputs")))

# The oracle (test/oracle: an independent numpy reference and checkpoint
# writer) needs a Python with numpy: Debian's python3-numpy, installed by
# utils/bootstrap.sh, or the one running lit if it has numpy.
def _python_with_numpy():
    import subprocess
    for exe in (sys.executable, "/usr/bin/python3"):
        try:
            subprocess.run([exe, "-c", "import numpy"], check=True,
                           capture_output=True)
            return exe
        except (OSError, subprocess.CalledProcessError):
            pass
    lit_config.fatal("no Python with numpy for the oracle tests; run "
                     "utils/bootstrap.sh (Debian package python3-numpy)")

_np_python = _python_with_numpy()
_oracle = os.path.join(config.test_source_root, "oracle")
_e2e = os.path.join(config.test_source_root, "e2e")
config.substitutions.append(("%reference", _np_python + " " + os.path.join(_oracle, "reference.py")))
config.substitutions.append(("%mkcheckpoint", _np_python + " " + os.path.join(_oracle, "make-checkpoint.py")))
config.substitutions.append(("%compare-logits", _np_python + " " + os.path.join(_e2e, "compare-logits.py")))
config.substitutions.append(("%check-ids", _np_python + " " + os.path.join(_e2e, "check-ids.py")))
config.substitutions.append(("%check-indexer", _np_python + " " + os.path.join(_oracle, "check-indexer.py")))
config.substitutions.append(("%check-mtp-tensors", _np_python + " " + os.path.join(_oracle, "check-mtp-tensors.py")))
config.substitutions.append(("%check-mtp-identity", _np_python + " " + os.path.join(_oracle, "check-mtp-identity.py")))
# The oracle's own reader of the fp9 weight images (docs/fp9.md, plan.md):
# checks every duck matrix against the checkpoint without Duck's importer.
_plan_dump = os.path.join(config.duck_tools_dir, "duck-plan-dump")
config.substitutions.append(("%fp9-oracle", _np_python + " " + os.path.join(_oracle, "fp9_images.py") + " --plan-dump " + _plan_dump))
config.substitutions.append(("%flip-weight-byte", _np_python + " " + os.path.join(_oracle, "flip-weight-byte.py") + " --plan-dump " + _plan_dump))

tools = ["duckc", "duck-mkmodel", "duck-opt", "duck-bench", "duck-plan-dump", "duckrun"]
llvm_config.add_tool_substitutions(tools, [config.duck_tools_dir])

# duckrun serve: the server driver (test/serve/serve.py) and the official
# openai npm client (utils/fetch-openai-client.sh installs it once).
_serve = os.path.join(config.test_source_root, "serve")
config.substitutions.append(("%serve", sys.executable + " " + os.path.join(_serve, "serve.py")))
config.substitutions.append(("%openai-client", "node " + os.path.join(_serve, "openai-client.cjs")))
config.substitutions.append(("%fetch-openai-client", "bash " + os.path.join(config.duck_src_root, "utils", "fetch-openai-client.sh")))
# The fetch scripts reach the npm registry as the caller does: behind a
# TLS-intercepting proxy that takes its proxy and CA variables, which lit
# would otherwise drop (utils/run-tests.sh also fetches before lit starts).
for _var in ("NODE_EXTRA_CA_CERTS", "SSL_CERT_FILE", "SSL_CERT_DIR",
             "HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy",
             "NO_PROXY", "no_proxy", "DUCK_NPM_TIMEOUT"):
    if _var in os.environ:
        config.environment[_var] = os.environ[_var]
for _var, _value in os.environ.items():
    if _var.lower().startswith("npm_config_"):
        config.environment[_var] = _value
# The npm cache outlives the tests (one download, then none).
config.environment["DUCK_NPM_CACHE"] = os.environ.get(
    "DUCK_NPM_CACHE",
    os.path.join(os.environ.get("XDG_CACHE_HOME") or
                 os.path.join(os.path.expanduser("~"), ".cache"), "duck", "npm"))

# Network namespaces (root, iproute2, and a kernel and container that
# allow them: probed with a throwaway namespace and veth pair): ducks on
# veth pairs.
def _netns_works():
    import shutil
    import subprocess
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or not shutil.which("ip"):
        return False
    name = "duckprobe%d" % (os.getpid() % 100000)
    run = lambda *c: subprocess.run(c, capture_output=True).returncode == 0
    try:
        return (run("ip", "netns", "add", name) and
                run("ip", "link", "add", name + "a", "type", "veth", "peer",
                    "name", name + "b"))
    finally:
        run("ip", "link", "del", name + "a")
        run("ip", "netns", "del", name)

if _netns_works():
    config.available_features.add("netns")
