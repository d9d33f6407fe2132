// A seeded generator for randomized tests: prints its seed; SEED=n replays a run.
export function seeded(name) {
  const seed = Number(process.env.SEED || Math.floor(Math.random() * 2 ** 31));
  console.log(`# ${name}: SEED=${seed}`);
  let state = seed >>> 0 || 1;
  const next = () => {
    // xorshift32
    state ^= state << 13; state >>>= 0;
    state ^= state >>> 17;
    state ^= state << 5; state >>>= 0;
    return state / 2 ** 32;
  };
  const alphabet = ["a", "b", "z", " ", "é", "ü", "日", "本", "🎉", "👩‍👩‍👧", "\u0000", "\r", "\n", "|", "\"", "\\"];
  const random = {
    seed,
    next,
    int: (n) => Math.floor(next() * n),
    text(max) {
      let out = "";
      const length = random.int(max + 1);
      for (let i = 0; i < length; i++) out += alphabet[random.int(alphabet.length)];
      return out;
    },
    scalar() {
      switch (random.int(7)) {
        case 0: return null;
        case 1: return random.next() < 0.5;
        case 2: return random.int(2 ** 31) - 2 ** 30;
        case 3: return (random.next() - 0.5) * 1e6;
        case 4: return random.text(80);
        case 5: return random.int(2 ** 20) * 2 ** 20;
        default: return random.text(8);
      }
    },
  };
  return random;
}
