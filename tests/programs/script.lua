-- script.lua: run by lua_driver.c. Deterministic output only (no pairs() order,
-- no addresses, no time).

print("Lua version: " .. _VERSION)

-- string operations -------------------------------------------------------------
local text = "The quick brown fox jumps over the lazy dog"
local words = {}
for w in text:gmatch("%a+") do words[#words + 1] = w:lower() end
print("words: " .. #words .. ", joined: " .. table.concat(words, "-"))
print("upper: " .. text:upper())
print("reversed: " .. text:reverse())
print("gsub: " .. (text:gsub("o", "0")))
print(string.format("format: %5d|%-6s|%08.3f|%x|%q", 42, "ab", math.pi, 48879, "q\"s"))
print("byte/char: " .. string.byte("A") .. " " .. string.char(72, 105))
print("rep/sub: " .. ("ab"):rep(3, ",") .. " " .. text:sub(5, 9) .. " " .. text:find("fox"))

-- tables, sorting, counting (ordered iteration only) -----------------------------
local counts = {}
for c in text:lower():gmatch("%a") do counts[c] = (counts[c] or 0) + 1 end
local letters = {}
for c in pairs(counts) do letters[#letters + 1] = c end
table.sort(letters, function(a, b)
  if counts[a] ~= counts[b] then return counts[a] > counts[b] end
  return a < b
end)
local top = {}
for i = 1, 5 do top[i] = letters[i] .. "=" .. counts[letters[i]] end
print("top letters: " .. table.concat(top, " "))

local people = {
  { name = "Ada", age = 36 }, { name = "Grace", age = 85 }, { name = "Linus", age = 54 },
  { name = "Ken", age = 81 }, { name = "Barbara", age = 84 },
}
table.sort(people, function(a, b) return a.age < b.age end)
local names = {}
for _, p in ipairs(people) do names[#names + 1] = p.name .. "(" .. p.age .. ")" end
print("sorted people: " .. table.concat(names, ", "))

-- closures --------------------------------------------------------------------------
local function counter(start, step)
  local n = start
  return function() n = n + step; return n end
end
local c1, c2 = counter(0, 1), counter(100, -7)
local seq = {}
for _ = 1, 5 do seq[#seq + 1] = c1() .. "/" .. c2() end
print("closures: " .. table.concat(seq, " "))

local function compose(...)
  local fs = { ... }
  return function(x)
    for i = #fs, 1, -1 do x = fs[i](x) end
    return x
  end
end
local f = compose(function(x) return x * 2 end, function(x) return x + 3 end)
print("compose: " .. f(10))

-- recursion + memoization (global fib is also called from C) --------------------------
local memo = {}
function fib(n)
  if n < 2 then return n end
  if memo[n] then return memo[n] end
  local v = fib(n - 1) + fib(n - 2)
  memo[n] = v
  return v
end
print("fib(80) = " .. fib(80))

-- metatables ---------------------------------------------------------------------------
local Vec = {}
Vec.__index = Vec
function Vec.new(x, y) return setmetatable({ x = x, y = y }, Vec) end
function Vec.__add(a, b) return Vec.new(a.x + b.x, a.y + b.y) end
function Vec.__mul(a, k) return Vec.new(a.x * k, a.y * k) end
function Vec.__tostring(v) return "(" .. v.x .. "," .. v.y .. ")" end
function Vec:dot(o) return self.x * o.x + self.y * o.y end
local v = Vec.new(1, 2) + Vec.new(3, 4) * 2
print("vector: " .. tostring(v) .. " dot=" .. v:dot(Vec.new(1, 1)))

-- coroutines ---------------------------------------------------------------------------
local function primes_gen(limit)
  return coroutine.wrap(function()
    for n = 2, limit do
      local is_prime = true
      for d = 2, math.floor(math.sqrt(n)) do
        if n % d == 0 then is_prime = false; break end
      end
      if is_prime then coroutine.yield(n) end
    end
  end)
end
local ps = {}
for p in primes_gen(60) do ps[#ps + 1] = p end
print("primes via coroutine: " .. table.concat(ps, " "))

local co = coroutine.create(function(a, b)
  local c = coroutine.yield(a + b)
  local d, e = coroutine.yield(c * 2)
  return d + e, "done"
end)
local r = {}
local ok, x = coroutine.resume(co, 1, 2); r[#r + 1] = tostring(ok) .. ":" .. x
ok, x = coroutine.resume(co, 10); r[#r + 1] = tostring(ok) .. ":" .. x
local ok3, sum, tag = coroutine.resume(co, 3, 4); r[#r + 1] = tostring(ok3) .. ":" .. sum .. ":" .. tag
r[#r + 1] = coroutine.status(co)
print("coroutine protocol: " .. table.concat(r, " "))

-- errors: pcall, error objects, error from C, xpcall ----------------------------------------
local ok1, err1 = pcall(function() error("plain failure", 0) end)
print("pcall 1: " .. tostring(ok1) .. " " .. err1)
local ok2, err2 = pcall(function() error({ code = 404, msg = "not found" }) end)
print("pcall 2: " .. tostring(ok2) .. " " .. err2.code .. " " .. err2.msg)
local ok4, err4 = pcall(function() local t = nil; return t.field end)
print("pcall 3: " .. tostring(ok4) .. " " .. (err4:match("attempt to index a nil value") or err4))
local ok5, err5 = pcall(host.fail, "from C")
print("pcall 4: " .. tostring(ok5) .. " " .. err5)
local ok6, err6 = xpcall(function() return 1 // 0 end, function(m) return "handled: " .. m:gsub("^.-:%d+: ", "") end)
print("xpcall: " .. tostring(ok6) .. " " .. err6)
local ok7, err7 = pcall(string.rep)
print("pcall 5: " .. tostring(ok7) .. " " .. err7)

-- integers/floats, math, string.pack -------------------------------------------------------
print("int ops: " .. (7 // 2) .. " " .. (7 % -3) .. " " .. (2 ^ 10) .. " " .. (1 << 40) .. " " .. math.maxinteger)
print("float: " .. string.format("%.10f %.3e", math.sin(1) + math.cos(1), math.exp(10)))
print("pack: " .. string.unpack("<i4", string.pack("<i4", -123456)) .. " " .. #string.pack(">I8d", 1, 2.5))
print("tointeger: " .. tostring(math.tointeger(3.0)) .. " " .. tostring(math.tointeger(3.5)))

-- a checksum over a larger workload, computed in C ----------------------------------------
local parts = {}
for i = 1, 2000 do parts[i] = string.format("%d:%x", i * i, i * 7919 % 65536) end
local blob = table.concat(parts, ";")
print("blob length: " .. #blob .. " checksum: " .. host.checksum(blob))

-- utf8 and goto ------------------------------------------------------------------------------
print("utf8: " .. utf8.len("héllo wörld") .. " " .. utf8.char(72, 228, 8364))
local n = 0
::again::
n = n + 1
if n < 5 then goto again end
print("goto loop: " .. n)

RESULT = fib(50) % 1000003
print("script done")
