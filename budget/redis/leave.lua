-- leave.lua: take a waiter out of the window's line.
--
-- KEYS[1..10] see common.lua
-- ARGV[1] id  reservation ID of the waiter
--
-- If it was first, the next waiter is woken. Returns 1.
line_leave(ARGV[1])
return 1
