"""The API emulator and the simulated cluster side tested on their own: real HTTP on
loopback, scripted containers on threads and real container processes."""
