"""The controller process: the `sn-monitor controller` command, serving, leading or standing by.

May import every other part of the controller (it is the top layer); nothing imports it.
"""
