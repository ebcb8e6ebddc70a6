# fail-summary.awk: reads the output of a Go test binary run with -test.v and,
# if any test failed, prints the last KEEP (default 25) lines of each failed
# test none of whose subtests failed. A failing suite dumps its hosts' logs
# after the failure message, and a CI excerpt shows only a window of the
# output: the summary puts the message next to the verdict.
#   awk -f fail-summary.awk [-v keep=N] OUTPUT
BEGIN { if (keep == "") keep = 25 }
/^=== (RUN|NAME|CONT) / { cur = $3; next }
/^=== PAUSE / { next }
/^ *--- (FAIL|PASS|SKIP): / {
	if ($2 == "FAIL:" && !($3 in failed)) { failed[$3] = 1; order[++nfailed] = $3 }
	if ($0 ~ /^---/) cur = ""
	next
}
cur != "" { n[cur]++; line[cur, n[cur] % keep] = $0 }
END {
	if (!nfailed) exit
	print "=== failure summary: the last lines of each failed test (full output above)"
	for (i = 1; i <= nfailed; i++) {
		t = order[i]
		for (u in failed) if (index(u, t "/") == 1) { t = ""; break }
		if (t == "") continue
		print "--- FAIL: " t
		first = n[t] > keep ? n[t] - keep + 1 : 1
		for (j = first; j <= n[t]; j++) print line[t, j % keep]
	}
}
