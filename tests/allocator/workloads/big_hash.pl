# A 2M-key hash of short strings (perl's SVs and hash entries are small
# malloc()ed objects), walked in key order; prints a digest of its contents.
use strict;
use warnings;
my $n = $ARGV[0] // 2000000;
my %h;
for my $i (1 .. $n) {
  $h{"key$i"} = "v" . ($i * 7 % 1000003) . "-" . ($i % 97);
}
my ($sum, $len) = (0, 0);
for my $i (1 .. $n) {
  my $v = $h{"key" . (($i * 31337) % $n + 1)};
  $len += length $v;
  $sum = ($sum * 33 + ord(substr($v, -1))) % 1000000007;
}
delete $h{"key$_"} for grep { $_ % 3 == 0 } 1 .. $n;
print scalar(keys %h), " keys left, $len bytes read, digest $sum\n";
