module fleet.bench/loadgen

go 1.22
