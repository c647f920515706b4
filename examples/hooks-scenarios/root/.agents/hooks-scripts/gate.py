#!/usr/bin/env python3
# The seed page's security gate (gate.py), verbatim in behaviour: deny any
# code_execution whose args mention `rm -rf`.
import json
import sys

data = json.load(sys.stdin)
cmd = str(data.get("tool_call", {}).get("args", {}))
if "rm -rf" in cmd:
    print(json.dumps({"decision": "deny", "reason": "Destructive command blocked by security gate."}))
else:
    print(json.dumps({"decision": "allow"}))
