module fleet.bench/stubgo

go 1.22
