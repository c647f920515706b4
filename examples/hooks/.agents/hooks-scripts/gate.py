#!/usr/bin/env python3
# Example pre-hook (the seed page's security gate): deny any code_execution whose
# arguments mention `rm -rf`. The event arrives on stdin, the decision goes to stdout.
import json
import sys

event = json.load(sys.stdin)
if "rm -rf" in str(event.get("tool_call", {}).get("args", {})):
    print(json.dumps({"decision": "deny", "reason": "Destructive command blocked by security gate."}))
else:
    print(json.dumps({"decision": "allow"}))
