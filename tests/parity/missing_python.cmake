# Stands in for a parity test when configure found no /usr/bin/python3: fail, saying what to install.
message(FATAL_ERROR "parity tests need the system Python with PyTorch (/usr/bin/python3 and Debian's python3-torch); "
                    "install them with scripts/setup --deps (or: apt-get install python3 python3-torch) and reconfigure")
