#!/usr/bin/env python3
"""Fails when a thiserror variant prints its cause and also exposes it as
its source(): anyhow's `{e:#}` (the CLI's error line) would print that cause
twice. A variant either carries its cause in its message (a plain field:
not `#[source]`, not `#[from]`, not named `source`) or leaves it to the
chain (`#[source]`/`#[from]`, or `#[error(transparent)]`), never both.

    python3 scripts/check-error-sources.py   # from the repository root
"""
import re
import subprocess
import sys

VARIANT = re.compile(
    r'#\[error\("((?:[^"\\]|\\.)*)"[^\]]*\)\]\s*(?:(?:///[^\n]*|#\[[^\]]*\])\s*)*'
    r'(\w+)\s*(\((?:[^()]|\([^()]*\))*\)|\{[^{}]*\})?'
)


def repeats(msg, body):
    if body.startswith("("):
        fields = [f.strip() for f in body[1:-1].split(",") if f.strip()]
        idx = [i for i, f in enumerate(fields) if "#[source]" in f or "#[from]" in f]
        return any(f"{{{i}" in msg or f".{i}" in msg for i in idx)
    names = set(re.findall(r"#\[(?:source|from)\]\s*(?:///[^\n]*\s*)*(?:pub\s+)?(\w+)\s*:", body))
    if re.search(r"(?:^|[\s{,])source\s*:", body):
        names.add("source")
    return any(f"{{{n}" in msg or f".{n}" in msg for n in names)


def main():
    files = subprocess.run(["git", "ls-files", "*.rs"], capture_output=True, text=True,
                           check=True).stdout.split()
    bad = []
    for path in files:
        if path.startswith("fuzz/"):
            continue
        src = open(path, encoding="utf-8").read()
        for m in VARIANT.finditer(src):
            msg, name, body = m.group(1), m.group(2), m.group(3) or ""
            if repeats(msg, body):
                line = src.count("\n", 0, m.start()) + 1
                bad.append(f"{path}:{line}: {name}: \"{msg}\"")
    if bad:
        print("these variants print their cause and also return it from source():")
        print("\n".join(bad))
        print("carry the cause in the message (a plain field) or in the chain, not both")
        sys.exit(1)


if __name__ == "__main__":
    main()
