# lit configuration for Duck: tool substitutions and test discovery.
import os
import sys

import lit.formats
from lit.llvm import llvm_config

config.name = "Duck"
config.test_format = lit.formats.ShTest(not llvm_config.use_lit_shell)
config.suffixes = [".test", ".mlir", ".json"]
config.excludes = ["Inputs", "lit.cfg.py", "lit.site.cfg.py", "unit", "oracle", "CMakeLists.txt"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.duck_obj_root, "test")

llvm_config.use_default_substitutions()  # FileCheck, not, count
llvm_config.with_environment("PATH", config.duck_tools_dir, append_path=True)
llvm_config.with_environment("PATH", config.llvm_tools_dir, append_path=True)

config.substitutions.append(("%duck_src", config.duck_src_root))
config.substitutions.append(("%models", os.path.join(config.duck_src_root, "models")))
config.substitutions.append(("%python", sys.executable))
config.substitutions.append(("%inputs", os.path.join(config.test_source_root, "Inputs")))

tools = ["duckc", "duck-mkmodel", "duck-opt", "duck-bench", "duck-plan-dump", "duckrun", "duck-reference"]
llvm_config.add_tool_substitutions(tools, [config.duck_tools_dir])
