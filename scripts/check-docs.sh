#!/usr/bin/env bash
# Every relative link in README.md, docs/*.md and pkg-config/README.md points at a file that
# exists and, where it names an anchor, at a heading of that file (GitHub's anchor rules); and
# the README stays a page read in a few minutes (at most 250 lines).
# Usage: scripts/check-docs.sh
set -euo pipefail
cd "$(dirname "$0")/.."

python3 - README.md docs/*.md pkg-config/README.md <<'EOF'
import os, re, sys

def slug(heading):
    # GitHub: markup dropped, lowercased, punctuation but '-' and '_' removed, spaces to '-'.
    s = re.sub(r'\[([^\]]*)\]\([^)]*\)', r'\1', heading)
    s = s.replace('`', '').replace('*', '').strip().lower()
    s = re.sub(r'[^\w\- ]', '', s)
    return s.replace(' ', '-')

def lines_outside_code(path):
    fenced = False
    for n, line in enumerate(open(path, encoding='utf-8'), 1):
        if line.lstrip().startswith('```'):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line

anchors = {}
def anchors_of(path):
    if path not in anchors:
        seen, found = {}, set()
        for _, line in lines_outside_code(path):
            m = re.match(r'#{1,6} (.*)', line)
            if m:
                base = slug(m.group(1))
                k = seen.get(base, 0)
                seen[base] = k + 1
                found.add(base if k == 0 else f'{base}-{k}')
        anchors[path] = found
    return anchors[path]

bad = []
for page in sys.argv[1:]:
    for n, line in lines_outside_code(page):
        line = re.sub(r'`[^`]*`', '', line)
        for target in re.findall(r'\]\(([^)\s]+)\)', line):
            if re.match(r'[a-z]+:', target):
                continue
            path, _, anchor = target.partition('#')
            full = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            if not os.path.exists(full):
                bad.append(f'{page}:{n}: {target}: no file {full}')
            elif anchor and (not full.endswith('.md') or anchor not in anchors_of(full)):
                bad.append(f'{page}:{n}: {target}: no heading #{anchor} in {full}')
for b in bad:
    print(b)
readme = sum(1 for _ in open('README.md', encoding='utf-8'))
if readme > 250:
    print(f'README.md: {readme} lines, more than 250')
sys.exit(1 if bad or readme > 250 else 0)
EOF
echo "docs: every relative link resolves"
