# Writes the plan schema text into a C++ header (for the JSON printer).
file(READ ${IN} _text)
file(WRITE ${OUT} "// Generated from plan.fbs; do not edit.\n#pragma once\nstatic const char *kDuckPlanSchemaText = R\"duckfbs(${_text})duckfbs\";\n")
