set terminal svg size 1200,900 noenhanced font "sans,11" background rgb "white"
set output "docs/results/schedule-peak.svg"
set multiplot layout 2,3 title "Peak KV memory against context (uniform H2O): full cache, oneshot and chunked eviction (equal peaks draw one line)"
set xlabel "context tokens"
set ylabel "peak KV KiB"
set key below horizontal height 1
set yrange [0:*]
set grid
set xtics (256, 320, 384, 448)
set title "stories260K, keep 0.1 (continuation 64)"
plot "docs/results/schedule-peak.dat" index 0 using 1:2 with linespoints title "full cache", "" index 0 using 1:3 with linespoints title "oneshot", "" index 0 using 1:4 with linespoints title "chunk 32", "" index 0 using 1:5 with linespoints title "chunk 64", "" index 0 using 1:6 with linespoints title "chunk 128"
set title "stories260K, keep 0.2 (continuation 64)"
plot "docs/results/schedule-peak.dat" index 1 using 1:2 with linespoints title "full cache", "" index 1 using 1:3 with linespoints title "oneshot", "" index 1 using 1:4 with linespoints title "chunk 32", "" index 1 using 1:5 with linespoints title "chunk 64", "" index 1 using 1:6 with linespoints title "chunk 128"
set title "stories260K, keep 0.3 (continuation 64)"
plot "docs/results/schedule-peak.dat" index 2 using 1:2 with linespoints title "full cache", "" index 2 using 1:3 with linespoints title "oneshot", "" index 2 using 1:4 with linespoints title "chunk 32", "" index 2 using 1:5 with linespoints title "chunk 64", "" index 2 using 1:6 with linespoints title "chunk 128"
set xtics (64, 80, 96)
set title "aidreams260K, keep 0.1 (continuation 32)"
plot "docs/results/schedule-peak.dat" index 3 using 1:2 with linespoints title "full cache", "" index 3 using 1:3 with linespoints title "oneshot", "" index 3 using 1:4 with linespoints title "chunk 16", "" index 3 using 1:5 with linespoints title "chunk 32", "" index 3 using 1:6 with linespoints title "chunk 64"
set title "aidreams260K, keep 0.2 (continuation 32)"
plot "docs/results/schedule-peak.dat" index 4 using 1:2 with linespoints title "full cache", "" index 4 using 1:3 with linespoints title "oneshot", "" index 4 using 1:4 with linespoints title "chunk 16", "" index 4 using 1:5 with linespoints title "chunk 32", "" index 4 using 1:6 with linespoints title "chunk 64"
set title "aidreams260K, keep 0.3 (continuation 32)"
plot "docs/results/schedule-peak.dat" index 5 using 1:2 with linespoints title "full cache", "" index 5 using 1:3 with linespoints title "oneshot", "" index 5 using 1:4 with linespoints title "chunk 16", "" index 5 using 1:5 with linespoints title "chunk 32", "" index 5 using 1:6 with linespoints title "chunk 64"
unset multiplot
