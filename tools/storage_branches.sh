#!/bin/sh
# Lines outside the store layer that branch on the storage medium (a folder vs an object
# store): medium flags, isinstance fallbacks, path-or-URI unions, scheme tests, and asking a
# store whether it is a local folder. Run from the repository root; `| wc -l` gives the count.
grep -rnE \
  -e 'self\.remote\b|\.remote (is|is not) None|\bis_local\b|\bis_remote\b|if remote\b' \
  -e '\.local (is|is not) None|location\.local\b|\.local or\b' \
  -e 'isinstance\([^)]*\b(RemoteRoot|LegFiles|TraceSink|Path|S3Store|FileStore|os\.PathLike)\b' \
  -e '(Path|str) \| (RemoteRoot|LegFiles|TraceSink|os\.PathLike\[str\] \| TraceSink)\b' \
  -e '-> Path \| str\b|: Path \| str = ' \
  -e 'startswith\("s3://"\)|"://" (not )?in (uri|run|self\.uri|store)\b|scheme (==|!=|not in|in) ' \
  -e 'self\._sink (is|is not) None|local_folder\(\)' \
  service/resumequal --include='*.py' | grep -v '^service/resumequal/store/'
