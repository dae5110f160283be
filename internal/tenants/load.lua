-- load.lua: the registry's version and every record, read at one instant.
--
-- KEYS[1] hash: tenant name -> record (JSON)
-- KEYS[3] string: the registry's version (KEYS[2] unused, given so that
--         every script names the same keys)
--
-- Returns {version, {name, record, name, record, ...}}.
return {redis.call('GET', KEYS[3]) or '0', redis.call('HGETALL', KEYS[1])}
