set terminal svg size 1100,760 dynamic noenhanced font 'Helvetica,12' background rgb 'white'
set output 'docs/results/aidreams260K.eval-1.svg'
set multiplot layout 2,2 title 'aidreams260K.bin: 128 eval windows of tinystories_valid.txt (96+32 tokens)'
set grid
set key below horizontal height 1
set xtics 0.1
set logscale y
set format y '%g'
$q_h2o_uniform << EOD
0.1 0.187085
0.2 0.121329
0.3 0.0827272
0.5 0.0372605
EOD
$q_h2o_pyramid << EOD
0.1 0.169948
0.2 0.0998657
0.3 0.0698212
0.5 0.0424382
EOD
$q_h2o_proportional << EOD
0.1 0.169208
0.2 0.0981624
0.3 0.0739395
0.5 0.0382935
EOD
$q_h2o_middle << EOD
0.1 0.255981
0.2 0.230684
0.3 0.216528
0.5 0.206274
EOD
$q_h2o_optimal << EOD
0.1 0.169208
0.2 0.0981624
0.3 0.0658778
0.5 0.0315814
EOD
set title 'quality vs budget (h2o scorer)'
set xlabel 'global keep ratio'
set ylabel 'mean KL(full || pruned)'
plot $q_h2o_uniform using 1:2 with linespoints lw 2 title 'uniform', $q_h2o_pyramid using 1:2 with linespoints lw 2 title 'pyramid', $q_h2o_proportional using 1:2 with linespoints lw 2 title 'proportional', $q_h2o_middle using 1:2 with linespoints lw 2 title 'middle', $q_h2o_optimal using 1:2 with linespoints lw 2 title 'optimal'
$s_h2o_0 << EOD
0.05 0.193055
0.1 0.120228
0.2 0.0722008
0.3 0.0391149
0.5 0.014695
0.75 0.00358343
EOD
$s_h2o_1 << EOD
0.05 0.0483711
0.1 0.0266611
0.2 0.0163719
0.3 0.0113864
0.5 0.004312
0.75 0.000958798
EOD
$s_h2o_2 << EOD
0.05 0.0500379
0.1 0.0396143
0.2 0.0305029
0.3 0.0239598
0.5 0.0134455
0.75 0.00505109
EOD
$s_h2o_3 << EOD
0.05 0.0220097
0.1 0.0173128
0.2 0.0122909
0.3 0.00779679
0.5 0.00441194
0.75 0.00158804
EOD
set title 'per-layer sensitivity (only that layer pruned, h2o)'
set ylabel 'mean kl (calibration windows)'
set xlabel 'keep ratio of that layer'
plot $s_h2o_0 using 1:2 with linespoints lw 2 title 'layer 0', $s_h2o_1 using 1:2 with linespoints lw 2 title 'layer 1', $s_h2o_2 using 1:2 with linespoints lw 2 title 'layer 2', $s_h2o_3 using 1:2 with linespoints lw 2 title 'layer 3'
$q_snapkv_uniform << EOD
0.1 0.239026
0.2 0.150053
0.3 0.107667
0.5 0.0653001
EOD
$q_snapkv_pyramid << EOD
0.1 0.218964
0.2 0.125879
0.3 0.0881337
0.5 0.0454016
EOD
$q_snapkv_proportional << EOD
0.1 0.226336
0.2 0.12398
0.3 0.0813544
0.5 0.0292256
EOD
$q_snapkv_middle << EOD
0.1 0.255665
0.2 0.22407
0.3 0.216684
0.5 0.206715
EOD
$q_snapkv_optimal << EOD
0.1 0.226336
0.2 0.12398
0.3 0.079156
0.5 0.0283813
EOD
set title 'quality vs budget (snapkv scorer)'
set xlabel 'global keep ratio'
set ylabel 'mean KL(full || pruned)'
plot $q_snapkv_uniform using 1:2 with linespoints lw 2 title 'uniform', $q_snapkv_pyramid using 1:2 with linespoints lw 2 title 'pyramid', $q_snapkv_proportional using 1:2 with linespoints lw 2 title 'proportional', $q_snapkv_middle using 1:2 with linespoints lw 2 title 'middle', $q_snapkv_optimal using 1:2 with linespoints lw 2 title 'optimal'
$s_snapkv_0 << EOD
0.05 0.193055
0.1 0.158178
0.2 0.111772
0.3 0.0839376
0.5 0.0556259
0.75 0.0220289
EOD
$s_snapkv_1 << EOD
0.05 0.0483711
0.1 0.0305047
0.2 0.0170768
0.3 0.0108983
0.5 0.00560561
0.75 0.00226922
EOD
$s_snapkv_2 << EOD
0.05 0.0500379
0.1 0.0365333
0.2 0.0263871
0.3 0.0194271
0.5 0.0110281
0.75 0.00605104
EOD
$s_snapkv_3 << EOD
0.05 0.0220097
0.1 0.0154901
0.2 0.00946554
0.3 0.00682619
0.5 0.00391545
0.75 0.00213047
EOD
set title 'per-layer sensitivity (only that layer pruned, snapkv)'
set ylabel 'mean kl (calibration windows)'
set xlabel 'keep ratio of that layer'
plot $s_snapkv_0 using 1:2 with linespoints lw 2 title 'layer 0', $s_snapkv_1 using 1:2 with linespoints lw 2 title 'layer 1', $s_snapkv_2 using 1:2 with linespoints lw 2 title 'layer 2', $s_snapkv_3 using 1:2 with linespoints lw 2 title 'layer 3'
unset multiplot
