-- Is `s` valid UTF-8 (as Python's strict decoder sees it: no overlongs, no surrogates, nothing
-- past U+10FFFF)? A hand-edited hash may hold bytes a decoding client cannot read at all; one
-- such job in a claim reply would make the whole batch unreadable.
-- Pure ASCII (the common case) costs one anchored run of a one-range class: ~2 ms per 512 KiB
-- here, where an unanchored string.find(s, '[\128-\255]') tried a match at every byte (~10 ms).
-- Otherwise, from the first byte >= 0x80 on, every valid sequence is replaced by an ASCII byte
-- (never by nothing, so no new sequence can form across a removal) and any byte >= 0x80 left
-- over is invalid. Each gsub pass tries a match at every byte, so the passes are kept short:
-- the first is the kind of the first sequence (text is mostly of one script), and a run of
-- ASCII bytes becomes one '.' before a pass when that shrinks the text much (~4x faster for
-- accented Latin, CJK and emoji text than seven passes over all of it).
local function is_utf8(s)
  local at = string.match(s, '^[^\128-\255]*()')
  if at > #s then return true end
  s = string.sub(s, at)
  local b = string.byte(s)
  local first = (b < 194 and 0) or (b < 224 and 1) or (b == 224 and 2) or (b == 237 and 4)
    or (b < 240 and 3) or (b == 240 and 5) or (b < 244 and 6) or (b == 244 and 7) or 0
  if first == 0 then return false end  -- no sequence starts with it
  local seq = { '[\194-\223][\128-\191]', '\224[\160-\191][\128-\191]',
    '[\225-\236\238\239][\128-\191][\128-\191]', '\237[\128-\159][\128-\191]',
    '\240[\144-\191][\128-\191][\128-\191]', '[\241-\243][\128-\191][\128-\191][\128-\191]',
    '\244[\128-\143][\128-\191][\128-\191]' }
  seq[1], seq[first] = seq[first], seq[1]
  -- Mostly ASCII from here (accented Latin text): its runs go first.
  local _, high = string.gsub(string.sub(s, 1, 256), '[\128-\255]', '')
  local squeeze = high * 2 < math.min(#s, 256)
  for _, p in ipairs(seq) do
    if squeeze then s = string.gsub(s, '[^\128-\255]+', '.') end
    local n
    s, n = string.gsub(s, p, '.')
    squeeze = n * 4 > #s  -- a quarter or more of it is '.' now
  end
  return string.match(s, '^[^\128-\255]*()') > #s
end
