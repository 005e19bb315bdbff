set terminal svg size 1200,400 font "sans,11"
set output "docs/results/schedule-peak.svg"
set multiplot layout 1,3 title "stories260K: peak KV memory against context (continuation 64, uniform H2O)"
set xlabel "context tokens"
set ylabel "peak KV KiB"
set key top left
set yrange [0:*]
set title "keep 0.1"
plot "docs/results/schedule-peak.dat" index 0 using 1:2 with linespoints title "full cache", "" index 0 using 1:3 with linespoints title "oneshot", "" index 0 using 1:4 with linespoints title "chunk 32", "" index 0 using 1:5 with linespoints title "chunk 64", "" index 0 using 1:6 with linespoints title "chunk 128"
set title "keep 0.2"
plot "docs/results/schedule-peak.dat" index 1 using 1:2 with linespoints title "full cache", "" index 1 using 1:3 with linespoints title "oneshot", "" index 1 using 1:4 with linespoints title "chunk 32", "" index 1 using 1:5 with linespoints title "chunk 64", "" index 1 using 1:6 with linespoints title "chunk 128"
set title "keep 0.3"
plot "docs/results/schedule-peak.dat" index 2 using 1:2 with linespoints title "full cache", "" index 2 using 1:3 with linespoints title "oneshot", "" index 2 using 1:4 with linespoints title "chunk 32", "" index 2 using 1:5 with linespoints title "chunk 64", "" index 2 using 1:6 with linespoints title "chunk 128"
unset multiplot
