// Builds realistic Java data structures until the process holds about TARGET_MIB MiB of
// anonymous memory, prints READY and waits for stdin to close (or to be killed).
//
// The data: Debian's package database parsed into objects, then generated records in a
// HashMap, a TreeMap index, ArrayLists of boxed numbers and strings, as a JVM service would.
//
// Usage: java -cp DIR Hold TARGET_MIB
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.*;

public class Hold {
    static final class Pkg {
        final Map<String, String> fields = new LinkedHashMap<>();
    }

    static final class Record {
        long id;
        String name;
        String version;
        List<String> depends;
        double score;
        int[] history;
        String summary;
        Map<String, Integer> counters;
    }

    static long rssAnonKiB() throws IOException {
        for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
            if (line.startsWith("RssAnon:")) return Long.parseLong(line.replaceAll("[^0-9]", ""));
        }
        return 0;
    }

    static List<Pkg> parse(Path path) {
        List<Pkg> pkgs = new ArrayList<>();
        try {
            Pkg cur = new Pkg();
            String last = null;
            for (String line : Files.readAllLines(path, StandardCharsets.UTF_8)) {
                if (line.isEmpty()) {
                    if (!cur.fields.isEmpty()) pkgs.add(cur);
                    cur = new Pkg();
                    last = null;
                } else if ((line.charAt(0) == ' ' || line.charAt(0) == '\t') && last != null) {
                    cur.fields.merge(last, "\n" + line.trim(), String::concat);
                } else {
                    int i = line.indexOf(':');
                    if (i > 0) {
                        last = line.substring(0, i);
                        cur.fields.put(last, line.substring(i + 1).trim());
                    }
                }
            }
            if (!cur.fields.isEmpty()) pkgs.add(cur);
        } catch (IOException e) {
            // synthetic below
        }
        if (pkgs.isEmpty()) {
            for (int i = 0; i < 500; i++) {
                Pkg p = new Pkg();
                p.fields.put("Package", "pkg" + i);
                p.fields.put("Version", "1." + i);
                p.fields.put("Description", "generated package");
                pkgs.add(p);
            }
        }
        return pkgs;
    }

    public static void main(String[] args) throws IOException {
        long targetKiB = Long.parseLong(args[0]) * 1024;
        Random rnd = new Random(99);
        List<Pkg> pkgs = parse(Path.of("/var/lib/dpkg/status"));
        List<String> words = new ArrayList<>(new TreeSet<>(Arrays.asList(
            pkgs.stream().map(p -> p.fields.getOrDefault("Description", "")).reduce("", (a, b) -> a + " " + b).split("\\s+"))));
        words.remove("");
        Map<String, Record> byName = new HashMap<>();
        TreeMap<String, List<Long>> byWord = new TreeMap<>();
        List<Record> all = new ArrayList<>();
        long i = 0;
        while (true) {
            for (int k = 0; k < 2000; k++, i++) {
                Pkg p = pkgs.get((int) (i % pkgs.size()));
                Record r = new Record();
                r.id = i;
                r.name = p.fields.getOrDefault("Package", "x") + "-" + i;
                r.version = p.fields.getOrDefault("Version", "0") + "+r" + (i % 97);
                r.depends = new ArrayList<>();
                for (String d : p.fields.getOrDefault("Depends", "").split(",")) {
                    if (!d.isBlank()) r.depends.add(d.trim());
                }
                r.score = rnd.nextDouble();
                r.history = new int[rnd.nextInt(12)];
                for (int h = 0; h < r.history.length; h++) r.history[h] = rnd.nextInt(1 << 20);
                StringBuilder sb = new StringBuilder();
                int n = 5 + rnd.nextInt(35);
                for (int w = 0; w < n; w++) {
                    String word = words.get(rnd.nextInt(words.size()));
                    if (w < 2) byWord.computeIfAbsent(word, x -> new ArrayList<>()).add(i);
                    sb.append(word).append(' ');
                }
                r.summary = sb.toString();
                r.counters = new HashMap<>();
                r.counters.put("downloads", rnd.nextInt(100000));
                r.counters.put("bugs", rnd.nextInt(50));
                byName.put(r.name, r);
                all.add(r);
            }
            if (rssAnonKiB() >= targetKiB) break;
        }
        System.out.println("READY records=" + all.size() + " rss_anon_kib=" + rssAnonKiB());
        System.out.flush();
        while (System.in.read() >= 0) {
            // hold the data until the dumper kills us or closes stdin
        }
        if (byName.size() + byWord.size() < 0) System.out.println("unreachable"); // keeps the data live
    }
}
