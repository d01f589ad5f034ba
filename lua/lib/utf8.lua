-- Is `s` valid UTF-8 (as Python's strict decoder sees it: no overlongs, no surrogates, nothing
-- past U+10FFFF)? A hand-edited hash may hold bytes a decoding client cannot read at all; one
-- such job in a claim reply would make the whole batch unreadable.
-- Pure ASCII (the common case) costs one C-level scan. Otherwise every valid sequence is
-- replaced by an ASCII byte (never by nothing, so no new sequence can form across a removal)
-- and any byte >= 0x80 left over is invalid.
local function is_utf8(s)
  if not string.find(s, '[\128-\255]') then return true end
  s = string.gsub(s, '[\194-\223][\128-\191]', '.')
  s = string.gsub(s, '\224[\160-\191][\128-\191]', '.')
  s = string.gsub(s, '[\225-\236\238\239][\128-\191][\128-\191]', '.')
  s = string.gsub(s, '\237[\128-\159][\128-\191]', '.')
  s = string.gsub(s, '\240[\144-\191][\128-\191][\128-\191]', '.')
  s = string.gsub(s, '[\241-\243][\128-\191][\128-\191][\128-\191]', '.')
  s = string.gsub(s, '\244[\128-\143][\128-\191][\128-\191]', '.')
  return not string.find(s, '[\128-\255]')
end
