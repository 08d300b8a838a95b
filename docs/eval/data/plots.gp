set terminal pngcairo size 640,440 font 'sans,10'
set output '/tmp/p/s7/eval/kv.png'
reset
set grid; set key below horizontal font ',8'; set xlabel 'local memory (% of working set)'; set ylabel 'performance / all-local (log)'; set xrange [20:105]; set logscale y; set yrange [0.0005:3]; set format y '%g'; set xtics (25, 50, 75, 100);
set title 'kv'
plot 1 with lines dt 2 lc rgb '#555555' title 'all-local', '/tmp/p/s7/eval/data/kv-fm-loopback.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'fm-loopback', '/tmp/p/s7/eval/data/kv-fm-tcp.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#2ca02c' title 'fm-tcp', '/tmp/p/s7/eval/data/kv-swap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#d62728' title 'swap', '/tmp/p/s7/eval/data/kv-zswap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#ff7f0e' title 'zswap'
set output '/tmp/p/s7/eval/sort.png'
reset
set grid; set key below horizontal font ',8'; set xlabel 'local memory (% of working set)'; set ylabel 'performance / all-local (log)'; set xrange [20:105]; set logscale y; set yrange [0.0005:3]; set format y '%g'; set xtics (25, 50, 75, 100);
set title 'sort'
plot 1 with lines dt 2 lc rgb '#555555' title 'all-local', '/tmp/p/s7/eval/data/sort-fm-loopback.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'fm-loopback', '/tmp/p/s7/eval/data/sort-fm-tcp.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#2ca02c' title 'fm-tcp', '/tmp/p/s7/eval/data/sort-swap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#d62728' title 'swap', '/tmp/p/s7/eval/data/sort-zswap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#ff7f0e' title 'zswap'
set output '/tmp/p/s7/eval/pagerank.png'
reset
set grid; set key below horizontal font ',8'; set xlabel 'local memory (% of working set)'; set ylabel 'performance / all-local (log)'; set xrange [20:105]; set logscale y; set yrange [0.0005:3]; set format y '%g'; set xtics (25, 50, 75, 100);
set title 'pagerank'
plot 1 with lines dt 2 lc rgb '#555555' title 'all-local', '/tmp/p/s7/eval/data/pagerank-fm-loopback.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'fm-loopback', '/tmp/p/s7/eval/data/pagerank-fm-tcp.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#2ca02c' title 'fm-tcp', '/tmp/p/s7/eval/data/pagerank-swap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#d62728' title 'swap', '/tmp/p/s7/eval/data/pagerank-zswap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#ff7f0e' title 'zswap'
set output '/tmp/p/s7/eval/scan.png'
reset
set grid; set key below horizontal font ',8'; set xlabel 'local memory (% of working set)'; set ylabel 'performance / all-local (log)'; set xrange [20:105]; set logscale y; set yrange [0.0005:3]; set format y '%g'; set xtics (25, 50, 75, 100);
set title 'scan'
plot 1 with lines dt 2 lc rgb '#555555' title 'all-local', '/tmp/p/s7/eval/data/scan-fm-loopback.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'fm-loopback', '/tmp/p/s7/eval/data/scan-fm-tcp.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#2ca02c' title 'fm-tcp', '/tmp/p/s7/eval/data/scan-swap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#d62728' title 'swap', '/tmp/p/s7/eval/data/scan-zswap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#ff7f0e' title 'zswap'
set output '/tmp/p/s7/eval/memcached.png'
reset
set grid; set key below horizontal font ',8'; set xlabel 'local memory (% of working set)'; set ylabel 'performance / all-local (log)'; set xrange [20:105]; set logscale y; set yrange [0.0005:3]; set format y '%g'; set xtics (25, 50, 75, 100);
set title 'memcached'
plot 1 with lines dt 2 lc rgb '#555555' title 'all-local', '/tmp/p/s7/eval/data/memcached-fm-loopback.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'fm-loopback', '/tmp/p/s7/eval/data/memcached-fm-tcp.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#2ca02c' title 'fm-tcp', '/tmp/p/s7/eval/data/memcached-swap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#d62728' title 'swap', '/tmp/p/s7/eval/data/memcached-zswap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#ff7f0e' title 'zswap'
set output '/tmp/p/s7/eval/faultlat-cdf.png'
reset
set grid; set key bottom right font ',8'; set logscale x; set xrange [0.05:*]; set yrange [0:1]; set xlabel 'latency (us, log)'; set ylabel 'fraction'; set title 'fault latency, random reads at 25% local';
plot '/tmp/p/s7/eval/data/cdf-fm-loopback-hist_ns.dat' using 1:2 with steps lw 2 dt 1 lc rgb '#1f77b4' title 'fm-loopback read (probe)', '/tmp/p/s7/eval/data/cdf-fm-loopback-fetch_hist_us.dat' using 1:2 with steps lw 2 dt 3 lc rgb '#1f77b4' title 'fm-loopback fetch (pager stats)', '/tmp/p/s7/eval/data/cdf-fm-tcp-hist_ns.dat' using 1:2 with steps lw 2 dt 1 lc rgb '#2ca02c' title 'fm-tcp read (probe)', '/tmp/p/s7/eval/data/cdf-fm-tcp-fetch_hist_us.dat' using 1:2 with steps lw 2 dt 3 lc rgb '#2ca02c' title 'fm-tcp fetch (pager stats)', '/tmp/p/s7/eval/data/cdf-swap-hist_ns.dat' using 1:2 with steps lw 2 dt 1 lc rgb '#d62728' title 'swap read (probe)', '/tmp/p/s7/eval/data/cdf-zswap-hist_ns.dat' using 1:2 with steps lw 2 dt 1 lc rgb '#ff7f0e' title 'zswap read (probe)'
set terminal pngcairo size 1440,680 font 'sans,9'
set output '/tmp/p/s7/eval/eval.png'
set multiplot layout 2,3 title 'farmem vs Linux swap: 6.18.44-fc-v782, 2 cpus, 23 GiB, load 1.29/1.24/1.96'
reset
set grid; set key below horizontal font ',8'; set xlabel 'local memory (% of working set)'; set ylabel 'performance / all-local (log)'; set xrange [20:105]; set logscale y; set yrange [0.0005:3]; set format y '%g'; set xtics (25, 50, 75, 100);
set title 'kv'
plot 1 with lines dt 2 lc rgb '#555555' title 'all-local', '/tmp/p/s7/eval/data/kv-fm-loopback.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'fm-loopback', '/tmp/p/s7/eval/data/kv-fm-tcp.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#2ca02c' title 'fm-tcp', '/tmp/p/s7/eval/data/kv-swap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#d62728' title 'swap', '/tmp/p/s7/eval/data/kv-zswap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#ff7f0e' title 'zswap'
reset
set grid; set key below horizontal font ',8'; set xlabel 'local memory (% of working set)'; set ylabel 'performance / all-local (log)'; set xrange [20:105]; set logscale y; set yrange [0.0005:3]; set format y '%g'; set xtics (25, 50, 75, 100);
set title 'sort'
plot 1 with lines dt 2 lc rgb '#555555' title 'all-local', '/tmp/p/s7/eval/data/sort-fm-loopback.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'fm-loopback', '/tmp/p/s7/eval/data/sort-fm-tcp.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#2ca02c' title 'fm-tcp', '/tmp/p/s7/eval/data/sort-swap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#d62728' title 'swap', '/tmp/p/s7/eval/data/sort-zswap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#ff7f0e' title 'zswap'
reset
set grid; set key below horizontal font ',8'; set xlabel 'local memory (% of working set)'; set ylabel 'performance / all-local (log)'; set xrange [20:105]; set logscale y; set yrange [0.0005:3]; set format y '%g'; set xtics (25, 50, 75, 100);
set title 'pagerank'
plot 1 with lines dt 2 lc rgb '#555555' title 'all-local', '/tmp/p/s7/eval/data/pagerank-fm-loopback.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'fm-loopback', '/tmp/p/s7/eval/data/pagerank-fm-tcp.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#2ca02c' title 'fm-tcp', '/tmp/p/s7/eval/data/pagerank-swap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#d62728' title 'swap', '/tmp/p/s7/eval/data/pagerank-zswap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#ff7f0e' title 'zswap'
reset
set grid; set key below horizontal font ',8'; set xlabel 'local memory (% of working set)'; set ylabel 'performance / all-local (log)'; set xrange [20:105]; set logscale y; set yrange [0.0005:3]; set format y '%g'; set xtics (25, 50, 75, 100);
set title 'scan'
plot 1 with lines dt 2 lc rgb '#555555' title 'all-local', '/tmp/p/s7/eval/data/scan-fm-loopback.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'fm-loopback', '/tmp/p/s7/eval/data/scan-fm-tcp.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#2ca02c' title 'fm-tcp', '/tmp/p/s7/eval/data/scan-swap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#d62728' title 'swap', '/tmp/p/s7/eval/data/scan-zswap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#ff7f0e' title 'zswap'
reset
set grid; set key below horizontal font ',8'; set xlabel 'local memory (% of working set)'; set ylabel 'performance / all-local (log)'; set xrange [20:105]; set logscale y; set yrange [0.0005:3]; set format y '%g'; set xtics (25, 50, 75, 100);
set title 'memcached'
plot 1 with lines dt 2 lc rgb '#555555' title 'all-local', '/tmp/p/s7/eval/data/memcached-fm-loopback.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#1f77b4' title 'fm-loopback', '/tmp/p/s7/eval/data/memcached-fm-tcp.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#2ca02c' title 'fm-tcp', '/tmp/p/s7/eval/data/memcached-swap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#d62728' title 'swap', '/tmp/p/s7/eval/data/memcached-zswap.dat' using 1:2 with linespoints lw 2 pt 7 lc rgb '#ff7f0e' title 'zswap'
reset
set grid; set key bottom right font ',8'; set logscale x; set xrange [0.05:*]; set yrange [0:1]; set xlabel 'latency (us, log)'; set ylabel 'fraction'; set title 'fault latency, random reads at 25% local';
plot '/tmp/p/s7/eval/data/cdf-fm-loopback-hist_ns.dat' using 1:2 with steps lw 2 dt 1 lc rgb '#1f77b4' title 'fm-loopback read (probe)', '/tmp/p/s7/eval/data/cdf-fm-loopback-fetch_hist_us.dat' using 1:2 with steps lw 2 dt 3 lc rgb '#1f77b4' title 'fm-loopback fetch (pager stats)', '/tmp/p/s7/eval/data/cdf-fm-tcp-hist_ns.dat' using 1:2 with steps lw 2 dt 1 lc rgb '#2ca02c' title 'fm-tcp read (probe)', '/tmp/p/s7/eval/data/cdf-fm-tcp-fetch_hist_us.dat' using 1:2 with steps lw 2 dt 3 lc rgb '#2ca02c' title 'fm-tcp fetch (pager stats)', '/tmp/p/s7/eval/data/cdf-swap-hist_ns.dat' using 1:2 with steps lw 2 dt 1 lc rgb '#d62728' title 'swap read (probe)', '/tmp/p/s7/eval/data/cdf-zswap-hist_ns.dat' using 1:2 with steps lw 2 dt 1 lc rgb '#ff7f0e' title 'zswap read (probe)'
unset multiplot
