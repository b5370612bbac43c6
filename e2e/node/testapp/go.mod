module fleet.test/testapp

go 1.22
